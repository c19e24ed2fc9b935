// Anchor of the shared LibTorch precompiled header (see HastenTorchPch.cmake).
