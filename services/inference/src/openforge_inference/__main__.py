from openforge_core.service import run_service
from openforge_inference.app import InferenceApp
from openforge_inference.settings import InferenceSettings

# Guarded: vLLM on CPU starts its engine core in a spawned process that re-imports __main__.
if __name__ == "__main__":
    run_service(InferenceSettings, InferenceApp)
