def install_http_routes():
    pass
