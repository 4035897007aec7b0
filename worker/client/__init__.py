"""The libraries that run in other people's processes: the gateway's
:class:`~worker.client.publisher.Publisher` and the tool runners'
:class:`~worker.client.runner.Runner`. They import the runtime's configuration, signing and
observability; the runtime never imports them."""
