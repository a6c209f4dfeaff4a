# keg's image: the control plane and the ext_proc service (one image, two commands:
# `keg control-plane ...`, `keg ext-proc ...`). Envoy runs from envoyproxy/envoy-contrib.
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
