from openforge_core.service import run_service
from openforge_trajectory_store.app import StoreApp
from openforge_trajectory_store.settings import StoreSettings

run_service(StoreSettings, StoreApp)
