"""Import-path entry holding the `flashinfer` stand-in (see parse_sglang.cpu.enable_flashinfer_standin)."""
