"""The DelveFS event handler: MinIO notifications -> LevelDB -> views, served over HTTP."""
