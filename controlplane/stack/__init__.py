"""The local stack: real etcd, Kafka (KRaft), Toxiproxy and PostgreSQL on loopback."""
