//! [`App`]: the router behind one hand-written layer that every request passes, in this
//! order: it is counted (`regbroker_http_requests_total`, by route and status), it takes
//! one of `max_in_flight` slots (more are answered 503 at once), it is bounded by the
//! request timeout (504), and on the routes that serve credentials it must present the
//! bearer token ([`super::access`]).
//!
//! One layer, written by hand, rather than axum's `from_fn` middlewares and a
//! `route_layer`: each of those clones a boxed service and boxes a future for every
//! request, which was a third of a cache hit's allocations (BENCHMARKS.md, "The hit
//! path"). Here a request costs one reference count and no allocation of its own, and one
//! that never waits (a cache hit) starts no timer.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use regbroker_provider::SecretString;
use tokio::task::Unconstrained;
use tokio::time::Sleep;
use tower_service::Service;

use super::access;
use super::error::AppError;
use crate::metrics::Metrics;

/// The endpoint as a service: what `serve` runs on each connection, and what tests call
/// in process (`tower::ServiceExt::oneshot`).
#[derive(Clone)]
pub struct App {
    router: Router,
    front: Arc<Front>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("max_in_flight", &self.front.limit.as_ref().map(|l| l.max))
            .field("token", &self.front.token.is_some())
            .finish()
    }
}

/// What the layer needs: where it counts, its limits, the token.
pub(super) struct Front {
    pub(super) metrics: Arc<Metrics>,
    /// `None` on the probe router, which is not limited.
    pub(super) limit: Option<Limit>,
    /// The bearer token the credential routes require, if any.
    pub(super) token: Option<Arc<SecretString>>,
}

/// Requests in flight and how long each may take.
pub(super) struct Limit {
    pub(super) in_flight: AtomicUsize,
    pub(super) max: usize,
    pub(super) timeout: Duration,
}

impl App {
    pub(super) fn new(router: Router, front: Front) -> App {
        App {
            router,
            front: Arc::new(front),
        }
    }
}

/// The label a path is counted under: its route, or `other` (no route matched).
fn route_label(path: &str) -> &'static str {
    match path {
        "/v1/credentials" => "/v1/credentials",
        "/v1/providers" => "/v1/providers",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        _ => "other",
    }
}

/// Whether the route and method serve credentials or provider details, so that the token
/// is required: the methods each route answers (`GET`, axum's `HEAD` with it, and
/// `DELETE` on credentials). Another method is answered 405 whatever the token.
fn needs_token(route: &'static str, method: &Method) -> bool {
    match route {
        "/v1/credentials" => {
            method == Method::GET || method == Method::HEAD || method == Method::DELETE
        }
        "/v1/providers" => method == Method::GET || method == Method::HEAD,
        _ => false,
    }
}

/// One request's hold on the layer: where it is counted when answered, and its in-flight
/// slot (if it took one), given back when the answer is ready or the client goes away.
/// One reference count per request.
struct Held {
    front: Arc<Front>,
    slot: bool,
}

impl Held {
    fn release(&mut self) {
        if std::mem::take(&mut self.slot)
            && let Some(limit) = &self.front.limit
        {
            limit.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

impl Front {
    /// The request's hold, with a slot, unless `max` are taken (then `Err`, with the
    /// hold to answer with).
    fn enter(self: &Arc<Front>) -> Result<Held, Held> {
        let mut held = Held {
            front: self.clone(),
            slot: false,
        };
        let Some(limit) = &self.limit else {
            return Ok(held);
        };
        if limit.in_flight.fetch_add(1, Ordering::AcqRel) >= limit.max {
            limit.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(held);
        }
        held.slot = true;
        Ok(held)
    }
}

impl<B> Service<axum::http::Request<B>> for App
where
    B: axum::body::HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = AppFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<B>) -> AppFuture {
        let route = route_label(req.uri().path());
        let done = |held: Held, response: Response| AppFuture {
            state: State::Done {
                response: Some(response),
            },
            route,
            held,
        };
        let held = match self.front.enter() {
            Ok(held) => held,
            Err(held) => {
                return done(
                    held,
                    AppError {
                        status: StatusCode::SERVICE_UNAVAILABLE,
                        code: "overloaded",
                        message: "too many requests in flight; retry shortly".into(),
                    }
                    .into_response(),
                );
            }
        };
        if needs_token(route, req.method())
            && let Some(token) = &self.front.token
            && !access::presents(req.headers(), token)
        {
            // Answered at once: its slot goes back at the first poll, with the answer.
            return done(held, access::unauthorized());
        }
        let req = req.map(axum::body::Body::new);
        let future = self.router.call(req);
        let state = match &self.front.limit {
            Some(limit) => State::Timed {
                future,
                timeout: limit.timeout,
                timer: None,
            },
            None => State::Untimed { future },
        };
        AppFuture { state, route, held }
    }
}

type RouteFuture = <Router as Service<Request>>::Future;

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State {
        Done { response: Option<Response> },
        // The timer starts at the request's first wait: a cache hit never waits, so it
        // reads no clock and takes no reference to the runtime's timer.
        Timed {
            #[pin] future: RouteFuture,
            timeout: Duration,
            #[pin] timer: Option<Unconstrained<Sleep>>,
        },
        Untimed { #[pin] future: RouteFuture },
    }
}

pin_project_lite::pin_project! {
    /// A request on its way: the router's answer (or the layer's own), counted when ready.
    pub struct AppFuture {
        #[pin]
        state: State,
        route: &'static str,
        held: Held,
    }
}

impl Future for AppFuture {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match this.state.project() {
            // Polled once: the layer answered by itself.
            StateProj::Done { response } => response.take().unwrap_or_default(),
            StateProj::Untimed { future } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => response,
                Poll::Ready(Err(never)) => match never {},
                Poll::Pending => return Poll::Pending,
            },
            StateProj::Timed {
                future,
                timeout,
                mut timer,
            } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => response,
                Poll::Ready(Err(never)) => match never {},
                Poll::Pending => {
                    if timer.is_none() {
                        // Polled outside the task's budget, as tokio's own `Timeout`
                        // does, so a request that spends the budget still times out.
                        timer.set(Some(tokio::task::unconstrained(tokio::time::sleep(
                            *timeout,
                        ))));
                    }
                    match timer.as_pin_mut().map(|timer| timer.poll(cx)) {
                        Some(Poll::Ready(())) => AppError {
                            status: StatusCode::GATEWAY_TIMEOUT,
                            code: "request_timeout",
                            message: format!(
                                "request took longer than {}",
                                humantime::format_duration(*timeout)
                            ),
                        }
                        .into_response(),
                        _ => return Poll::Pending,
                    }
                }
            },
        };
        this.held.release();
        this.held
            .front
            .metrics
            .http_request(this.route, response.status().as_u16());
        Poll::Ready(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_under_their_route_or_other() {
        for route in [
            "/v1/credentials",
            "/v1/providers",
            "/healthz",
            "/readyz",
            "/metrics",
        ] {
            assert_eq!(route_label(route), route);
        }
        // What axum routes no handler for: a trailing slash, a prefix, another case.
        for path in [
            "/v1/credentials/",
            "/v1",
            "/",
            "/V1/credentials",
            "/metricsx",
        ] {
            assert_eq!(route_label(path), "other", "{path}");
        }
    }

    #[test]
    fn the_token_guards_each_method_its_route_answers_and_no_other() {
        let creds = "/v1/credentials";
        for m in [Method::GET, Method::HEAD, Method::DELETE] {
            assert!(needs_token(creds, &m), "{m}");
        }
        assert!(needs_token("/v1/providers", &Method::GET));
        assert!(needs_token("/v1/providers", &Method::HEAD));
        // Answered 405 whatever the token, as before (the token guarded the routes'
        // handlers, not axum's method-not-allowed answer).
        assert!(!needs_token(creds, &Method::POST));
        assert!(!needs_token("/v1/providers", &Method::DELETE));
        for route in ["/healthz", "/readyz", "/metrics", "other"] {
            assert!(!needs_token(route, &Method::GET), "{route}");
        }
    }

    #[test]
    fn slots_are_taken_up_to_the_cap_and_given_back_when_dropped() {
        let front = Arc::new(Front {
            metrics: Arc::new(Metrics::new()),
            limit: Some(Limit {
                in_flight: AtomicUsize::new(0),
                max: 2,
                timeout: Duration::from_secs(1),
            }),
            token: None,
        });
        let in_flight = || {
            front
                .limit
                .as_ref()
                .map(|l| l.in_flight.load(Ordering::SeqCst))
        };
        let enter = || match front.enter() {
            Ok(held) => held,
            Err(_) => panic!("no slot below the cap"),
        };
        let a = enter();
        let b = enter();
        assert!(a.slot && b.slot);
        assert!(front.enter().is_err(), "a third request past a cap of 2");
        assert_eq!(in_flight(), Some(2), "a refused request holds no slot");
        drop(a);
        assert_eq!(in_flight(), Some(1));
        let mut c = enter();
        assert!(c.slot);
        c.release();
        c.release();
        assert_eq!(in_flight(), Some(1), "a slot given back twice");
        drop((b, c));
        assert_eq!(in_flight(), Some(0));

        let unlimited = Arc::new(Front {
            metrics: Arc::new(Metrics::new()),
            limit: None,
            token: None,
        });
        assert!(matches!(unlimited.enter(), Ok(Held { slot: false, .. })));
    }
}
