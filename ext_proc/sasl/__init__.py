"""SASL at the gateway: keg logging in to brokers (`login`), and keg authenticating
clients itself when a listener terminates SASL (`scram`, `credentials`, `oauth`,
`termination`)."""
