//! `backoff`: to be written.
