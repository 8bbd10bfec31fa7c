"""``python -m sglang_r3.launch_server [sglang flags...]``: SGLang's launcher with routing capture
(the serving wing's ``serving/launch.py``)."""

from sglang_r3.serving.launch import main, prepare  # noqa: F401  (prepare: the launch path's checks)

if __name__ == "__main__":
    main()
