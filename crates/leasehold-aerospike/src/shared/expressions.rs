//! The server-side pieces every shared write is built from: counting live holders and testing the
//! waiting writer's marker in filter expressions, and the operation that sweeps expired holder
//! entries. Holders expire by their entries, not by the record, so each write cleans up as it goes.

use aerospike::expressions::maps as map_exp;
use aerospike::expressions::{eq, int_bin, int_val, lt, map_bin, or, Expression};
use aerospike::operations::maps::{self, MapReturnType};
use aerospike::operations::Operation;
use aerospike::Value;

use crate::layout::{HOLDERS_BIN, WRITER_BIN};

/// Entries of the holder map whose expiry is at or after `cut` (live ones, with `cut = now + 1`).
pub(super) fn live_count(cut: i64) -> Expression {
    map_exp::get_by_value_range(
        MapReturnType::COUNT,
        Some(int_val(cut)),
        None,
        map_bin(HOLDERS_BIN),
        &[],
    )
}

/// No waiting writer's marker in force.
pub(super) fn marker_dead(cut: i64) -> Expression {
    or(vec![
        eq(aerospike::expressions::bin_type(WRITER_BIN), int_val(0)),
        lt(int_bin(WRITER_BIN), int_val(cut)),
    ])
}

/// Removes the holder entries that expired before `cut`.
pub(super) fn sweep(cut: i64) -> Operation {
    maps::remove_by_value_range(
        HOLDERS_BIN,
        Value::Nil,
        Value::from(cut),
        MapReturnType::NONE,
    )
}
