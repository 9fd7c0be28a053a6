//! Tests of the replayable request body.

mod commit;
mod props;
mod rules;
mod support;
