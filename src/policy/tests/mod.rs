//! Tests of the policies that read more than one module: the README's defaults table.

mod defaults;
