from twisted.application.service import ServiceMaker


class AuditServiceMaker(ServiceMaker):
    @property
    def options(self):
        from auditbroker.tap import options

        return options()


auditbroker = AuditServiceMaker(
    "auditbroker", "auditbroker.tap", "msgbroker with admin/ topics for root only.", "auditbroker"
)
