from twisted.application.service import ServiceMaker


class BrokerServiceMaker(ServiceMaker):
    """``twistd msgbroker``. Its options are built when twistd asks for them (only for
    ``twistd msgbroker``), from the installed plugins' configuration sections, so plugin
    options (``--journal ...``) are twistd options too."""

    @property
    def options(self):
        from msgbroker.tap import twistd_options

        return twistd_options()


msgbroker = BrokerServiceMaker(
    "msgbroker", "msgbroker.tap", "One broker for SSMP, STMP, Micromessage2 and sbus.", "msgbroker"
)
