"""Owns the Files and Batch APIs: their schema, stores, line handling and the batch run."""
