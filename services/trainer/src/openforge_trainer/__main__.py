from openforge_core.service import run_service
from openforge_trainer.app import TrainerApp
from openforge_trainer.settings import TrainerSettings

run_service(TrainerSettings, TrainerApp)
