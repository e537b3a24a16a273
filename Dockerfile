# syntax=docker/dockerfile:1
# Minimal image; the Kubernetes delivery work hardens it further (static binary, labels).
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin regbroker

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/regbroker /usr/local/bin/regbroker
USER nonroot:nonroot
EXPOSE 8477
ENTRYPOINT ["/usr/local/bin/regbroker"]
CMD ["serve"]
