"""The inference service's composition root."""

from __future__ import annotations

import grpc
import structlog

from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_inference.domain.model_dir import read_model_dir
from openforge_inference.servicer import InferenceServicer
from openforge_inference.settings import InferenceSettings

log = structlog.get_logger(__name__)


class InferenceApp:
    """Reads the configured model directory at start; ready once it is read."""

    def __init__(self, settings: InferenceSettings) -> None:
        self.service_names = [inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name]
        self.settings = settings
        path = settings.model_path
        name = settings.model_name or (path.name if path is not None else "")
        self.servicer = InferenceServicer(name, settings.engine)

    def register(self, server: grpc.aio.Server) -> None:
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        path = self.settings.model_path
        if path is None:
            log.warning("model.none_configured")
            return
        self.servicer.model = read_model_dir(path)
        log.info("model.described", path=str(path), vocab_size=self.servicer.model.vocab_size)

    async def close(self) -> None:
        return None
