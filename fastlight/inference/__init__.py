"""The batched inference worker of a rank, its trainer-side client, and its settings."""

from fastlight.inference.settings import InferenceSettings

__all__ = ["InferenceSettings"]
