//! The sans-IO stream protocol (owned by issue 3 work).
