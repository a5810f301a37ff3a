"""A leader-only queueflow app configured from the environment.

Run share-group coordinators and share-partition leaders for topics whose share agents live in
other processes (or other code bases)::

    queueflow leader --app thumbnails --topic jobs --broker kafka://localhost:9092

which runs ``faust -A queueflow.devtools.standalone worker`` with:

=========================  ==================================================================
``QUEUEFLOW_APP_ID``       the app id the members use (``ShareConsumer(app_id=...)``)
``QUEUEFLOW_TOPICS``       comma-separated source topics to lead
``QUEUEFLOW_BROKER_URL``   Faust broker URL, e.g. ``kafka://localhost:9092``
=========================  ==================================================================

Share-group settings come from their ``QUEUEFLOW_*`` environment variables
(docs/configuration.md).
"""

from __future__ import annotations

import os

from queueflow.errors import ConfigurationError
from queueflow.faust_app import App


def _require(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ConfigurationError(f"${name} is not set; queueflow.devtools.standalone needs it")
    return value


app = App(_require("QUEUEFLOW_APP_ID"), broker=_require("QUEUEFLOW_BROKER_URL"), role="leader")
for _topic in _require("QUEUEFLOW_TOPICS").split(","):
    if _topic.strip():
        app.share_groups.lead(_topic.strip())
