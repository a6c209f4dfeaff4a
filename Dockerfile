# Three images from one file:
# - `--target module`: keg's Kafka filter (envoy/kafka_filter, a Rust dynamic module for
#   Envoy 1.40) in /keg, for the Helm chart's init container (native.moduleImage);
# - `--target envoy`: Envoy 1.40 (contrib build) with that module on its
#   ENVOY_DYNAMIC_MODULES_SEARCH_PATH: the native data path (docker-compose's envoy);
# - the default (last) target: keg itself, the control plane and the ext_proc service
#   (one image, two commands: `keg control-plane ...`, `keg ext-proc ...`).

# Built on bullseye: its glibc (2.31) is older than the Envoy image's, so the module
# loads there.
FROM rust:1-slim-bullseye AS module-build
WORKDIR /src
COPY envoy/kafka_filter/Cargo.toml envoy/kafka_filter/Cargo.lock ./
COPY envoy/kafka_filter/src src
RUN cargo build --release --locked

FROM debian:bookworm-slim AS module
COPY --from=module-build /src/target/release/libkeg_kafka_filter.so /keg/

FROM envoyproxy/envoy-contrib:v1.40-latest AS envoy
COPY --from=module-build /src/target/release/libkeg_kafka_filter.so /usr/local/lib/keg/
ENV ENVOY_DYNAMIC_MODULES_SEARCH_PATH=/usr/local/lib/keg

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/keg
COPY pyproject.toml README.md ./
COPY kafka_wire kafka_wire
COPY filter_rules filter_rules
COPY interceptors interceptors
COPY ext_proc ext_proc
COPY control_plane control_plane
COPY pipeline pipeline
COPY keg keg
COPY envoy envoy
# A regular (not editable) install; the rule files stay in /opt/keg/filter_rules for
# the compose file's bind mount (a GitOps checkout replaces them).
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --home-dir /var/lib/keg --create-home keg \
    && mkdir -p /var/log/keg && chown keg /var/log/keg
USER keg
ENTRYPOINT ["keg"]
CMD ["--help"]
