"""podbay.gateway"""
