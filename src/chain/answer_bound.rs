//! A bound on what one relayed answer may take from the nodes (access.md §3c,
//! `server.max_relay_answer_bytes`): every upstream body read while an [`AnswerBudget`] is in
//! scope, for every entry of a caller's batch together, counts against it as it arrives. A node
//! that declares a longer body is not read at all; one that sends more than is left is cut off at
//! the frame that crosses the bound. So a single call whose answer is megabytes (an `eth_call`
//! returning a large buffer) costs routerd at most the bound, not the answer.
//!
//! The budget travels with the caller's task (a task-local), because the HTTP client reads the
//! body in the task that asked: requests sent without one (the settlement engine's, verify's,
//! the coalesced requests' own task) are bounded only by the client's `max_response_size`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use jsonrpsee::core::http_helpers::HttpError;
use jsonrpsee::http_client::transport::Error as TransportError;
use jsonrpsee::http_client::{HttpRequest, HttpResponse};

tokio::task_local! {
    static BUDGET: AnswerBudget;
}

/// Bytes one answer may still read; shared by the entries of a batch.
#[derive(Debug, Clone)]
pub struct AnswerBudget(Arc<Spent>);

#[derive(Debug)]
struct Spent {
    limit: usize,
    read: AtomicUsize,
    exceeded: AtomicBool,
}

impl AnswerBudget {
    pub fn new(limit: usize) -> Self {
        Self(Arc::new(Spent {
            limit,
            read: AtomicUsize::new(0),
            exceeded: AtomicBool::new(false),
        }))
    }

    /// Runs `work` with this budget counting every upstream body it reads.
    pub async fn scope<F: Future>(&self, work: F) -> F::Output {
        BUDGET.scope(self.clone(), work).await
    }

    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// Whether some read went beyond the bound (the answer is refused as a whole).
    pub fn exceeded(&self) -> bool {
        self.0.exceeded.load(Ordering::Relaxed)
    }

    fn left(&self) -> usize {
        self.0
            .limit
            .saturating_sub(self.0.read.load(Ordering::Relaxed))
    }

    /// Counts `bytes`; false, and exceeded from then on, when they do not fit.
    fn take(&self, bytes: usize) -> bool {
        let before = self.0.read.fetch_add(bytes, Ordering::Relaxed);
        let fits = before.saturating_add(bytes) <= self.0.limit;
        if !fits {
            self.0.exceeded.store(true, Ordering::Relaxed);
        }
        fits
    }

    fn refuse(&self) -> TransportError {
        self.0.exceeded.store(true, Ordering::Relaxed);
        let too_large = AnswerTooLarge {
            limit: self.0.limit,
        };
        TransportError::Http(HttpError::Stream(Box::new(too_large)))
    }
}

/// The budget of the answer this task is reading, if it has one.
pub fn current() -> Option<AnswerBudget> {
    BUDGET.try_with(Clone::clone).ok()
}

/// Whether the answer this task is reading went over its bound: an upstream request that failed
/// for it says nothing about the node.
pub fn exceeded_here() -> bool {
    BUDGET.try_with(AnswerBudget::exceeded).unwrap_or(false)
}

/// Why an upstream body was not read to its end.
#[derive(Debug, thiserror::Error)]
#[error("the answer is larger than server.max_relay_answer_bytes ({limit} bytes)")]
pub struct AnswerTooLarge {
    pub limit: usize,
}

/// The HTTP client layer that counts bodies against the task's [`AnswerBudget`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CountAnswersLayer;

impl<S> tower::Layer<S> for CountAnswersLayer {
    type Service = CountAnswers<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountAnswers(inner)
    }
}

#[derive(Debug, Clone)]
pub struct CountAnswers<S>(S);

type Answer = Result<HttpResponse<Counted>, TransportError>;

impl<S> tower::Service<HttpRequest> for CountAnswers<S>
where
    S: tower::Service<HttpRequest, Response = HttpResponse<Incoming>, Error = TransportError>,
    S::Future: Send + 'static,
{
    type Response = HttpResponse<Counted>;
    type Error = TransportError;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequest) -> Self::Future {
        let budget = current();
        if let Some(spent) = budget.as_ref().filter(|b| b.exceeded()) {
            // Another entry of the same answer crossed the bound: nothing more is asked.
            return Box::pin(std::future::ready(Err(spent.refuse())));
        }
        let response = self.0.call(request);
        Box::pin(async move {
            let response = response.await?;
            if let Some(budget) = &budget {
                if declared_length(&response).is_some_and(|length| length > budget.left()) {
                    return Err(budget.refuse());
                }
            }
            Ok(response.map(|body| Counted { body, budget }))
        })
    }
}

fn declared_length(response: &HttpResponse<Incoming>) -> Option<usize> {
    response
        .headers()
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// An upstream body whose frames are counted as they arrive.
pub struct Counted {
    body: Incoming,
    budget: Option<AnswerBudget>,
}

impl Body for Counted {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let (Some(budget), Some(data)) = (&self.budget, frame.data_ref()) {
            if !budget.take(data.len()) {
                let too_large = AnswerTooLarge {
                    limit: budget.limit(),
                };
                return Poll::Ready(Some(Err(Box::new(too_large))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_shared_and_once_exceeded_stays_exceeded() {
        let budget = AnswerBudget::new(10);
        let entry = budget.clone();
        assert!(budget.take(6));
        assert_eq!(entry.left(), 4);
        assert!(!entry.take(5), "6 + 5 is over 10");
        assert!(budget.exceeded());
        assert_eq!(budget.left(), 0);
    }

    #[tokio::test]
    async fn the_budget_is_the_tasks_within_its_scope_only() {
        assert!(current().is_none());
        let budget = AnswerBudget::new(1);
        let inside = budget
            .scope(async {
                assert!(!exceeded_here());
                current().map(|b| b.take(2))
            })
            .await;
        assert_eq!(inside, Some(false));
        assert!(budget.exceeded());
        assert!(!exceeded_here(), "outside the scope no budget applies");
    }
}
