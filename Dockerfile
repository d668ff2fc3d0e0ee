# syntax=docker/dockerfile:1
#
# The `spindle` binary (every role: director, router, manager, drainer, dashboard, ...) in a
# small Debian image. Used by docker-compose.yml; build it alone with
#   docker build -t spindle:local .
# The builder's Rust is the workspace's `rust-version` (tests/compose.rs checks they agree).

FROM rust:1.94-bookworm AS builder
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit); the binary is copied out
# of the cached target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p spindle --bin spindle \
    && install -D -m 0755 target/release/spindle /out/spindle

FROM debian:bookworm-slim
# ca-certificates: HTTPS deliveries and S3; curl: the health checks of docker-compose.yml.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 spindle \
    && useradd --system --uid 10001 --gid spindle --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin spindle
COPY --from=builder /out/spindle /usr/local/bin/spindle
USER spindle:spindle
# Director RPC, router, dashboard, manager and drainer /metrics (as docker-compose.yml uses them).
EXPOSE 8080 8070 8090 9100
ENTRYPOINT ["spindle"]
CMD ["--help"]
