//! Transports that bring `ToDataplane` messages in — Felix's fd 3/4 pipes, a JSON stream on stdin
//! or a unix socket, a state document — each feeding one bounded channel. Does not interpret them.
