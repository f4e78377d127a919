from twisted.application.service import ServiceMaker

msgbroker = ServiceMaker(
    "msgbroker", "msgbroker.tap", "One broker for SSMP, STMP, Micromessage2 and sbus.", "msgbroker"
)
