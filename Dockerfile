# syntax=docker/dockerfile:1
#
# regbroker container image: a static (musl) release binary on distroless/static.
# The final image has no shell and no package manager, runs as a numeric non-root user
# (65532) and writes nothing at run time, so it runs with readOnlyRootFilesystem.
# /usr/local/bin/docker-credential-regbroker is the same program linked without PIE
# (scripts/build-release.sh says why: a one-shot helper starts 3x faster); invoked under
# that name it speaks the docker credential-helper protocol. The sidecar binary keeps PIE.
#
# Build (needs a Docker engine, which the development machines do not have; CI lints
# this file with hadolint):
#   docker build -t regbroker --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
# The musl C compiler: aws-lc-sys (rustls' crypto provider) and ring compile C code.
# aws-lc-sys needs only a C compiler for x86_64 and aarch64 Linux, gnu or musl; cmake,
# clang and Go are needed only for its FIPS build or other targets.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Native build for the image's platform (linux/amd64 or linux/arm64).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    rustup target add "$(uname -m)-unknown-linux-musl" \
 && CARGO_FLAGS=--locked bash scripts/build-release.sh /out

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="regbroker" \
      org.opencontainers.image.description="Credential broker for OCI registries: workload identity in, short-lived registry credentials out" \
      org.opencontainers.image.source="https://github.com/regbroker/regbroker" \
      org.opencontainers.image.url="https://github.com/regbroker/regbroker" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 8477
ENTRYPOINT ["/usr/local/bin/regbroker"]
CMD ["serve"]
