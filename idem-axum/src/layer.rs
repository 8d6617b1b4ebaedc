//! `Idempotency-Key` as a tower layer: [`IdempotencyLayer`] runs
//! [`Idempotency::begin`] before the handler and `finish` or `abandon`
//! after it, and the handler takes the request's transaction with the
//! [`RequestTx`] extractor.

use super::call::RequestCall;
use super::policy::Idempotency;
use super::request::{IdempotentRequest, head_of};
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::Backend;
use idem_core::{CallerTx, Source};
use sqlx::Pool;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tracing::Instrument as _;

/// The largest body [`IdempotencyLayer`] reads by default (axum's own
/// default body limit).
pub const DEFAULT_MAX_BODY: usize = 2 << 20;

impl Idempotency {
    /// This policy as a tower layer over the routes it wraps, their
    /// transactions on `pool`: the handler is written once, plainly, and
    /// takes the request's transaction with [`RequestTx`]. See
    /// [`IdempotencyLayer`].
    pub fn layer<DB: Backend>(&self, pool: &Pool<DB>) -> IdempotencyLayer<DB> {
        IdempotencyLayer {
            pool: pool.clone(),
            policy: self.clone(),
            max_body: DEFAULT_MAX_BODY,
        }
    }
}

/// [`Idempotency::begin`] before the handler, `finish` after it.
///
/// 1. the body, read whole: over [`max_body`](Self::max_body) (by its
///    `Content-Length` or as it arrives) → 413;
/// 2. [`Idempotency::begin`]: the key (400), the caller (401), the record
///    (the stored answer replayed, 409, 422), the transaction begun; its
///    answers are sent as they are;
/// 3. the handler, with the body put back (its `Json<T>`, `Bytes`… work)
///    and the transaction in reach of [`RequestTx`];
/// 4. its answer, below 500: stored and committed with its effects
///    ([`RequestCall::finish`]), and replayed to every retry with the key,
///    a 4xx of its extractors included; 500 and over: rolled back, the key
///    freed, the answer sent without being kept
///    ([`RequestCall::abandon`]).
///
/// A handler that still holds its [`RequestTx`] when it has answered (it
/// gave it to a task, or to its response's body) is a mistake: its
/// answer is replaced by 500, nothing commits, and the key is freed once
/// the transaction is let go.
///
/// Put it on the routes that take keys (`post(handler).layer(…)`, or
/// `Router::route_layer`) rather than `Router::layer`: on a router's
/// fallback a 404 would be kept as an answer too.
pub struct IdempotencyLayer<DB: Backend> {
    pool: Pool<DB>,
    policy: Idempotency,
    max_body: usize,
}

impl<DB: Backend> IdempotencyLayer<DB> {
    /// The largest body read (default [`DEFAULT_MAX_BODY`]); a larger one
    /// is answered 413 before the key is looked at.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }
}

impl<DB: Backend> Clone for IdempotencyLayer<DB> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            pool: self.pool.clone(),
            policy: self.policy.clone(),
            max_body: self.max_body,
        }
    }
}

impl<DB: Backend> std::fmt::Debug for IdempotencyLayer<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("policy", &self.policy)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

impl<S, DB: Backend> tower_layer::Layer<S> for IdempotencyLayer<DB> {
    type Service = IdempotencyService<S, DB>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`IdempotencyLayer`] around `S`.
pub struct IdempotencyService<S, DB: Backend> {
    inner: S,
    layer: IdempotencyLayer<DB>,
}

impl<S: Clone, DB: Backend> Clone for IdempotencyService<S, DB> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, DB: Backend> std::fmt::Debug for IdempotencyService<S, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

impl<S, DB> tower_service::Service<Request> for IdempotencyService<S, DB>
where
    DB: Backend,
    S: tower_service::Service<Request, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        // The service made ready goes with this request; a clone stays.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        let span = tracing::info_span!(
            "idempotent_request",
            scope = layer.policy.scope(),
            method = %req.method(),
            path = req.uri().path(),
        );
        #[cfg(feature = "opentelemetry")]
        {
            let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
            idem_core::requests::continue_trace(&span, header("traceparent"), header("tracestate"));
        }
        Box::pin(async move { Ok(layer.run(ready, req).await) }.instrument(span))
    }
}

impl<DB: Backend> IdempotencyLayer<DB> {
    async fn run<S>(self, mut inner: S, req: Request) -> Response
    where
        S: tower_service::Service<Request, Error = Infallible>,
        S::Response: IntoResponse,
    {
        let policy = &self.policy;
        let (mut parts, body) = req.into_parts();
        let body = match self.read(&parts, body).await {
            Ok(body) => body,
            Err(answer) => return answer,
        };
        let request = IdempotentRequest::new(head_of(&parts), body.clone());
        let mut call = match policy.begin(&self.pool, &request).await {
            Ok(call) => call,
            Err(answer) => return answer,
        };
        let slot = Slot(Arc::new(Mutex::new(call.take_tx())));
        parts.extensions.insert(slot.clone());
        let answer = match inner
            .call(Request::from_parts(parts, Body::from(body)))
            .await
        {
            Ok(answer) => answer.into_response(),
            Err(never) => match never {},
        };
        // The handler has answered: its extractors are dropped.
        match slot.0.try_lock().ok().and_then(|mut tx| tx.take()) {
            Some(tx) => call.put_tx(tx),
            None => return still_held(call),
        }
        if answer.status().is_server_error() {
            call.abandon(answer).await
        } else {
            call.finish(answer).await
        }
    }

    /// The whole body, at most `max_body` bytes.
    async fn read(&self, parts: &Parts, body: Body) -> Result<Bytes, Response> {
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body as u64) {
            return Err(self.too_large());
        }
        match Limited::new(body, self.max_body).collect().await {
            Ok(body) => Ok(body.to_bytes()),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(self.too_large()),
            Err(e) => Err(self.policy.problem(
                StatusCode::BAD_REQUEST,
                "Unreadable body",
                format!("the request's body could not be read: {e}"),
            )),
        }
    }

    fn too_large(&self) -> Response {
        self.policy.problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Body too large",
            format!("this route reads bodies of at most {} bytes", self.max_body),
        )
    }
}

/// The handler kept its [`RequestTx`] past its answer: nothing commits;
/// the transaction rolls back when it is let go, and the key is freed
/// after (in the background: the record stays locked until then).
fn still_held<DB: Backend>(call: RequestCall<DB>) -> Response {
    let policy = call.policy().clone();
    drop(call);
    let why = "the handler still holds its RequestTx after answering (kept by a task \
               or by the response's body): nothing was committed";
    tracing::error!(scope = policy.scope(), "idempotent request: {why}");
    policy.problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Internal error",
        why.into(),
    )
}

/// The request's transaction, between the layer and the handler.
struct Slot<DB: Backend>(Arc<Mutex<Option<CallerTx<DB>>>>);

impl<DB: Backend> Clone for Slot<DB> {
    fn clone(&self) -> Self {
        Slot(self.0.clone())
    }
}

/// The transaction of an `Idempotency-Key` request behind
/// [`IdempotencyLayer`]: an extractor that dereferences to the request's
/// [`CallerTx`]. Its effects commit with the answer the handler returns
/// (below 500), or not at all.
///
/// `handler(&mut tx, &args)` runs an
/// [`#[idempotent]`](https://docs.rs/idem-runtime/latest/idem_runtime/attr.idempotent.html) handler inside it;
/// `tx.conn()?` and `tx.transaction()?` are the connection and the
/// transaction, for the handler's own statements and
/// [`enqueue`](idem_core::outbox::enqueue). Do not keep it past the
/// handler's answer.
///
/// On a route without the layer (or with the layer of another database)
/// extracting it answers 500, as does taking it twice in one request.
pub struct RequestTx<DB: Backend> {
    tx: OwnedMutexGuard<Option<CallerTx<DB>>>,
}

impl<DB: Backend> std::fmt::Debug for RequestTx<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RequestTx").field(&*self.tx).finish()
    }
}

impl<DB: Backend> std::ops::Deref for RequestTx<DB> {
    type Target = CallerTx<DB>;
    fn deref(&self) -> &CallerTx<DB> {
        self.tx.as_ref().expect("present while extracted")
    }
}

impl<DB: Backend> std::ops::DerefMut for RequestTx<DB> {
    fn deref_mut(&mut self) -> &mut CallerTx<DB> {
        self.tx.as_mut().expect("present while extracted")
    }
}

/// `enqueue(&mut tx, …)` in the request's transaction.
impl<DB: Backend> idem_core::outbox::InTransaction<DB> for RequestTx<DB> {
    fn in_transaction(&mut self) -> Result<&mut DB::Connection, idem_core::Error> {
        self.conn()
    }
}

impl<'a, DB: Backend> From<&'a mut RequestTx<DB>> for Source<'a, DB> {
    fn from(tx: &'a mut RequestTx<DB>) -> Self {
        Source::transaction(tx)
    }
}

impl<S: Send + Sync, DB: Backend> FromRequestParts<S> for RequestTx<DB> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Response> {
        let Some(slot) = parts.extensions.get::<Slot<DB>>() else {
            return Err(misuse(format!(
                "RequestTx<{}> is extracted on a route without Idempotency::layer \
                 (on this database)",
                std::any::type_name::<DB>()
            )));
        };
        match slot.0.clone().try_lock_owned() {
            Ok(tx) if tx.is_some() => Ok(RequestTx { tx }),
            Ok(_) => Err(misuse(
                "RequestTx is extracted after the request has answered".into(),
            )),
            Err(_) => Err(misuse("RequestTx is extracted twice in one request".into())),
        }
    }
}

/// A programming error: 500, and an error in the log.
fn misuse(why: String) -> Response {
    tracing::error!("idempotent request: {why}");
    super::Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "Internal error", why).into_response()
}
