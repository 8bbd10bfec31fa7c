def install_capture_patches():
    pass
