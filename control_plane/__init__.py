"""keg's control plane: discovers Kafka brokers, compiles Envoy resources, serves xDS.

The layers point one way (go-control-plane's split): `topology` finds brokers,
`envoy_resources` compiles a `GatewayPlan` into Envoy listeners and clusters,
`snapshot` holds immutable versioned bundles per node with no knowledge of gRPC,
`ads` streams them to Envoys, `service` wires it all together.
"""
