//! Transports that drive the protocol core.
