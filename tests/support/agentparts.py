"""A ResourceAgent's front-end parts, reached through its public front-end (`ResourceAgent.front`)
rather than through copies kept on the agent for the tests: each function checks the agent
serves that kind of front-end, so a test of the wrong mode fails with a clear message."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from patchbay_agent.cdi import CdiSpecs
    from patchbay_agent.deviceplugin.frontend import DevicePluginFrontEnd
    from patchbay_agent.deviceplugin.registration import Registrar
    from patchbay_agent.deviceplugin.server import DevicePluginServicer
    from patchbay_agent.dra.claimstatus import ClaimStatusWriter
    from patchbay_agent.dra.frontend import DraFrontEnd
    from patchbay_agent.dra.slicepublisher import SlicePublisher
    from patchbay_agent.kubelet.draplugin import DraPlugin
    from patchbay_agent.resourceagent import ResourceAgent


def _device_plugin(agent: ResourceAgent) -> DevicePluginFrontEnd:
    from patchbay_agent.deviceplugin.frontend import DevicePluginFrontEnd

    front = agent.front
    assert isinstance(front, DevicePluginFrontEnd), f"not a device-plugin agent: {type(front).__name__}"
    return front


def _dra(agent: ResourceAgent) -> DraFrontEnd:
    from patchbay_agent.dra.frontend import DraFrontEnd

    front = agent.front
    assert isinstance(front, DraFrontEnd), f"not a DRA agent: {type(front).__name__}"
    return front


def registrar_of(agent: ResourceAgent) -> Registrar:
    return _device_plugin(agent).registrar


def servicer_of(agent: ResourceAgent) -> DevicePluginServicer:
    return _device_plugin(agent).servicer


def cdi_of(agent: ResourceAgent) -> CdiSpecs | None:
    return _device_plugin(agent).cdi


def dra_of(agent: ResourceAgent) -> DraPlugin:
    return _dra(agent).plugin


def publisher_of(agent: ResourceAgent) -> SlicePublisher:
    return _dra(agent).publisher


def claim_status_of(agent: ResourceAgent) -> ClaimStatusWriter:
    return _dra(agent).claim_status
