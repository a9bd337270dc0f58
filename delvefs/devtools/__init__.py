"""Tools around the product, not part of it: real MinIO + RabbitMQ on loopback
(``localservices``), a fault injector between a mount and S3 (``faultproxy``) and the
publish/subscribe alignment demo (``demo``). The real handler process for tests and
benchmarks is ``eventhandler.devtools``: it uses the handler's own modules."""
