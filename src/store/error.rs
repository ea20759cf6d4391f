//! What the storage layer asks of the errors of the computations it runs. A chunk is
//! computed by a view, which fails with its own error type (`view::ViewError`); the layer
//! hands that error to every reader that waited for the computation and adds a few of its
//! own (a panic, a broken invariant, warming without a disk cache), without knowing the
//! type: [`ChunkError`] is the whole contract, so `store` never imports `view`.

use std::sync::Arc;

/// A job panicked; the pool reports it to every waiter as an error.
#[derive(Debug)]
pub struct Panicked(pub String);

/// The error type of chunk computations, as the storage layer builds and shares it.
pub trait ChunkError: From<Panicked> + Send + Sync + 'static {
    /// The one error of a computation, handed to each reader that waited for it.
    fn shared(e: Arc<Self>) -> Self;
    /// A broken invariant of the storage layer (a bug), or a resource it could not get.
    fn internal(msg: String) -> Self;
    /// An option the request needs is missing or wrong (`disk_cache` for warming).
    fn option(option: &'static str, rule: String) -> Self;
}

/// The error the storage layer's own tests compute with (the layer is tested without views).
#[cfg(test)]
#[derive(Debug, thiserror::Error)]
pub(crate) enum TestError {
    /// A computation refused its input.
    #[error("{0}")]
    Failed(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("option {option}: {rule}")]
    Option { option: &'static str, rule: String },
    #[error(transparent)]
    Shared(Arc<TestError>),
}

#[cfg(test)]
impl TestError {
    /// The error itself, through the sharing of a computation's error with its waiters.
    pub(crate) fn root(&self) -> &TestError {
        match self {
            TestError::Shared(inner) => inner.root(),
            other => other,
        }
    }
}

#[cfg(test)]
impl From<Panicked> for TestError {
    fn from(p: Panicked) -> Self {
        TestError::Internal(format!("chunk computation panicked: {}", p.0))
    }
}

#[cfg(test)]
impl ChunkError for TestError {
    fn shared(e: Arc<Self>) -> Self {
        TestError::Shared(e)
    }
    fn internal(msg: String) -> Self {
        TestError::Internal(msg)
    }
    fn option(option: &'static str, rule: String) -> Self {
        TestError::Option { option, rule }
    }
}
