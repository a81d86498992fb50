"""Verify-window layout and custom-mask paged attention (torch-native and FlashInfer)."""
