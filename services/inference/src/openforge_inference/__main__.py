from openforge_core.service import run_service
from openforge_inference.app import InferenceApp
from openforge_inference.settings import InferenceSettings

run_service(InferenceSettings, InferenceApp)
