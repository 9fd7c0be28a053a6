//! `config`: to be written.
