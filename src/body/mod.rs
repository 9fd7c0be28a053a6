//! Replayable request bodies: to be written.
