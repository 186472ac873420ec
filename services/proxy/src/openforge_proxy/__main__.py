from openforge_core.service import run_service
from openforge_proxy.app import ProxyApp
from openforge_proxy.settings import ProxySettings

run_service(ProxySettings, ProxyApp)
