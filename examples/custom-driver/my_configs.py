"""A user's own DistributedConfig: extra fields, and its own driver."""
from typing import List, Optional

from training_toolkit.distributed import DistributedConfig


class CustomDriver(DistributedConfig):
    process_count_per_node: Optional[int] = None
    driver_args: Optional[List[str]] = None

    @property
    def driver_dir(self):
        return "drivers"

    @property
    def driver_script(self):
        return "custom_driver.py"
