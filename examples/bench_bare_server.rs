//! The reference for `bench/run.sh`: a bare axum server that answers every GET with a
//! fixed JSON body, on the same runtime and axum features as `regbroker serve`.
//!
//! Usage: `bench_bare_server LISTEN BODY_FILE` (e.g. `127.0.0.1:0 body.json`). It prints
//! `listening on ADDR` once bound. The bench gives it the sidecar's own answer as the
//! body, so both servers send the same bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::IntoResponse;
use axum::routing::get;
use bytes::Bytes;

/// The same allocator as the `regbroker` binary, so the comparison measures regbroker's
/// work rather than the allocator.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(body_file)) = (args.next(), args.next()) else {
        eprintln!("usage: bench_bare_server LISTEN BODY_FILE");
        std::process::exit(64);
    };
    let body = Bytes::from(std::fs::read(&body_file).expect("read BODY_FILE"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let answer = move || {
            let body = body.clone();
            async move {
                let mut res = body.into_response();
                let headers = res.headers_mut();
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                res
            }
        };
        let app = Router::new().route("/v1/credentials", get(answer));
        let listener = tokio::net::TcpListener::bind(&listen).await.unwrap();
        println!("listening on {}", listener.local_addr().unwrap());
        axum::serve(listener, app).await.unwrap();
    });
}
