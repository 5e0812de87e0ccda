//! librsock.so
