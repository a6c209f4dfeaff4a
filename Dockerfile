# keg's image: the control plane and the ext_proc service (one image, two commands).
FROM python:3.11-slim
WORKDIR /opt/keg
COPY pyproject.toml README.md ./
COPY kafka_wire kafka_wire
COPY filter_rules filter_rules
COPY ext_proc ext_proc
COPY control_plane control_plane
COPY keg keg
COPY envoy envoy
RUN pip install --no-cache-dir -e .
ENTRYPOINT ["keg"]
