"""podbay.client"""
