"""confluent-kafka adapters: the one client factory and topic administration."""
