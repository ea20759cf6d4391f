//! Numeric formats: pure functions over bytes and rows, no I/O. One file per format.

pub mod ggml_type;

pub use ggml_type::GgmlType;
