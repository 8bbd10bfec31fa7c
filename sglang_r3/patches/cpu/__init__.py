def install_cpu_patches():
    pass
