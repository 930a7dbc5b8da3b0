//! The Box aggregate.
