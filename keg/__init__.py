"""keg: Kafka Envoy Gateway."""
