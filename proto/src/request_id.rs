//! The id that lets one request be followed through the logs: a client
//! opens a span with it for each call an engine makes, sends it to the
//! masters in the [`HEADER`] metadata of every gRPC call made for that call,
//! and the master's gRPC layer opens its own span with it. The Raft entry a
//! handler proposes is logged with its log index inside that span, and the
//! index is what `apply` logs, so a slow put can be followed from the engine
//! to the state machine without the id entering the replicated log.

use std::fmt;
use std::future::Future;

/// The gRPC metadata key that carries a request id.
pub const HEADER: &str = "crescent-request-id";

/// A random 64-bit id, written as 16 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(u64);

impl RequestId {
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// The id a header carries: exactly 16 hex digits, else none (a header
    /// is caller input and is never logged unchecked).
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(text, 16).ok().map(Self)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

tokio::task_local! {
    static CURRENT: RequestId;
}

/// Runs `fut` with `id` as the task's current request id.
pub async fn scope<F: Future>(id: RequestId, fut: F) -> F::Output {
    CURRENT.scope(id, fut).await
}

/// The current task's request id, if a caller set one with [`scope`].
/// A task spawned inside the scope does not inherit it.
pub fn current() -> Option<RequestId> {
    CURRENT.try_with(|id| *id).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_reads_back_from_its_text_and_nothing_else_parses() {
        let id = RequestId::random();
        assert_eq!(RequestId::parse(&id.to_string()), Some(id));
        assert_eq!(RequestId(0xab).to_string(), "00000000000000ab");
        for bad in [
            "",
            "ab",
            "00000000000000abc",
            "zzzzzzzzzzzzzzzz",
            "+000000000000000",
        ] {
            assert_eq!(RequestId::parse(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn the_id_is_current_only_inside_its_scope() {
        assert_eq!(current(), None);
        let id = RequestId::random();
        let inside = scope(id, async { current() }).await;
        assert_eq!(inside, Some(id));
        assert_eq!(current(), None);
    }
}
