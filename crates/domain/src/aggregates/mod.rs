//! cqrs-es aggregates whose `handle` only calls a pure `decide()`.
