//! Tests of the replayable request body.

mod props;
mod rules;
mod support;
