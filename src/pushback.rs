//! `pushback`: to be written.
