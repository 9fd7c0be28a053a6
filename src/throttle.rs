//! `throttle`: to be written.
