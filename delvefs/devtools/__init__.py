"""Tools around the product, not part of it: real MinIO + RabbitMQ on loopback
(``localservices``), a real handler process for tests and benchmarks
(``handlerprocess``) and the publish/subscribe alignment demo (``demo``)."""
