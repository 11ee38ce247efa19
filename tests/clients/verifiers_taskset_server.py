"""Host one resources server class as verifiers' NeMo Gym taskset does (``verifiers/v1/tasksets/nemo_gym/serving/server.py``).

Its steps, in its order: bind a socket on 127.0.0.1 port 0; import the class named by
``NEMO_GYM_RESOURCE_SERVER`` (``module:Class``); read the config class from the server class's
``config`` field; build the server with a config of only name, host, port and entrypoint and a
``ServerClient`` pointed at a head server that does not exist (port 11000) with an empty global
config; ``setup_webserver()``, ``setup_liveness(app)``, ``setup_exception_middleware(app)``; write
the port to ``nemo_gym.port`` in the working directory; serve the app with uvicorn on that socket.
"""

from __future__ import annotations

import os
import socket
from importlib import import_module
from pathlib import Path

import uvicorn
from omegaconf import OmegaConf

from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import ServerClient

HOST = "127.0.0.1"


def main() -> None:
    """Serve the class until killed."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, 0))
    port = listener.getsockname()[1]

    module_name, class_name = os.environ["NEMO_GYM_RESOURCE_SERVER"].split(":", 1)
    server_class = getattr(import_module(module_name), class_name)
    config_class = server_class.model_fields["config"].annotation
    folder = module_name.rsplit(".", 2)[-2] if "." in module_name else module_name
    server = server_class(
        config=config_class(name=folder, host=HOST, port=port, entrypoint="app.py"),
        server_client=ServerClient(
            head_server_config=BaseServerConfig(host=HOST, port=11000),
            global_config_dict=OmegaConf.create({}),
        ),
    )
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    Path("nemo_gym.port").write_text(str(port), encoding="ascii")
    uvicorn.Server(uvicorn.Config(app, host=HOST, port=port)).run(sockets=[listener])


if __name__ == "__main__":
    main()
